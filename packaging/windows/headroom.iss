; Inno Setup script for Headroom (Inno Setup 6.3 or later).
; Built by packaging/build.py, which passes the defines below:
;   ISCC /DAppVersion=0.1.0 /DNumericVersion=0.1.0.0 /DSourceDir=dist\headroom
;        /DOutputDir=dist /DOutputBase=headroom-0.1.0-setup /DIconFile=...\headroom.ico headroom.iss
;
; Installs for the current user by default (no administrator rights); the setup offers to install
; for all users instead. The uninstaller keeps settings, history and job logs (under
; %LOCALAPPDATA%\headroom) unless the user says to delete them, or /REMOVEDATA is given.

#ifndef AppVersion
  #error Pass /DAppVersion=... (packaging/build.py does)
#endif
#ifndef NumericVersion
  #define NumericVersion "0.0.0.0"
#endif
#ifndef SourceDir
  #define SourceDir "..\..\dist\headroom"
#endif
#ifndef OutputDir
  #define OutputDir "..\..\dist"
#endif
#ifndef OutputBase
  #define OutputBase "headroom-" + AppVersion + "-setup"
#endif

#define AppName "Headroom"
#define TrayExe "headroomw.exe"
#define CliExe "headroom.exe"
; The value the tray's own "Start at login" setting uses, so both agree on one entry.
#define RunKey "Software\Microsoft\Windows\CurrentVersion\Run"
#define RunValue "Headroom"

[Setup]
; Never change AppId: it ties upgrades and the uninstaller to earlier installs.
AppId={{6B0E9D64-4C5B-4F43-9C1E-2E1A4E7C3B21}
AppName={#AppName}
AppVersion={#AppVersion}
AppVerName={#AppName} {#AppVersion}
AppPublisher={#AppName}
VersionInfoVersion={#NumericVersion}
VersionInfoProductName={#AppName}
VersionInfoDescription={#AppName} setup
DefaultDirName={autopf}\{#AppName}
DefaultGroupName={#AppName}
DisableProgramGroupPage=yes
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog commandline
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
MinVersion=10.0
OutputDir={#OutputDir}
OutputBaseFilename={#OutputBase}
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern
ChangesEnvironment=yes
; The tray and the engine hold files open; the code below ends them before files are replaced.
CloseApplications=yes
RestartApplications=no
UninstallDisplayName={#AppName}
UninstallDisplayIcon={app}\{#TrayExe}
#ifdef IconFile
SetupIconFile={#IconFile}
#endif

[Languages]
Name: "english"; MessagesFile: "compiler:Default.isl"

[Tasks]
Name: "startatlogin"; Description: "Start {#AppName} when I sign in"; GroupDescription: "Options:"
Name: "addtopath"; Description: "Add the headroom command to PATH (for PowerShell and cmd)"; GroupDescription: "Options:"; Flags: unchecked
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
Source: "{#SourceDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[InstallDelete]
; An upgrade replaces the whole bundle: files a newer build no longer has must not linger.
Type: filesandordirs; Name: "{app}\_internal"

[Icons]
Name: "{autoprograms}\{#AppName}"; Filename: "{app}\{#TrayExe}"; WorkingDir: "{app}"
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\{#TrayExe}"; WorkingDir: "{app}"; Tasks: desktopicon

[Registry]
Root: HKCU; Subkey: "{#RunKey}"; ValueType: string; ValueName: "{#RunValue}"; ValueData: """{app}\{#TrayExe}"""; Flags: uninsdeletevalue; Tasks: startatlogin
Root: HKCU; Subkey: "Environment"; ValueType: expandsz; ValueName: "Path"; ValueData: "{olddata};{app}"; Check: NeedsAddPath(ExpandConstant('{app}')); Tasks: addtopath

[Run]
Filename: "{app}\{#TrayExe}"; Description: "Start {#AppName} now"; Flags: nowait postinstall skipifsilent

[Code]
const
  EnvironmentKey = 'Environment';

{ Ends this user's Headroom processes (the tray and the engine): their files are about to be
  replaced or removed. Not /T: the jobs they started keep running; the next engine finds them. }
procedure StopHeadroom();
var
  ResultCode: Integer;
begin
  Exec(ExpandConstant('{sys}\taskkill.exe'),
       '/F /FI "USERNAME eq ' + GetUserNameString() + '" /IM {#TrayExe} /IM {#CliExe}',
       '', SW_HIDE, ewWaitUntilTerminated, ResultCode);
end;

function PrepareToInstall(var NeedsRestart: Boolean): String;
begin
  StopHeadroom();
  Result := '';
end;

{ True when Dir is not yet one of the entries of the user's PATH. }
function NeedsAddPath(Dir: String): Boolean;
var
  Path: String;
begin
  if not RegQueryStringValue(HKEY_CURRENT_USER, EnvironmentKey, 'Path', Path) then
  begin
    Result := True;
    exit;
  end;
  Result := Pos(';' + Uppercase(Dir) + ';', ';' + Uppercase(Path) + ';') = 0;
end;

procedure RemoveFromPath(Dir: String);
var
  Path: String;
  P: Integer;
begin
  if not RegQueryStringValue(HKEY_CURRENT_USER, EnvironmentKey, 'Path', Path) then
    exit;
  Path := ';' + Path + ';';
  P := Pos(';' + Uppercase(Dir) + ';', Uppercase(Path));
  if P = 0 then
    exit;
  Delete(Path, P, Length(Dir) + 1);
  Path := Copy(Path, 2, Length(Path) - 2);
  RegWriteExpandStringValue(HKEY_CURRENT_USER, EnvironmentKey, 'Path', Path);
end;

{ The tray's own setting can also have written the Run value: remove it when it starts this copy. }
procedure RemoveRunValue();
var
  Command: String;
begin
  if RegQueryStringValue(HKEY_CURRENT_USER, '{#RunKey}', '{#RunValue}', Command) then
    if Pos(Uppercase(ExpandConstant('{app}')), Uppercase(Command)) > 0 then
      RegDeleteValue(HKEY_CURRENT_USER, '{#RunKey}', '{#RunValue}');
end;

function RemoveDataAsked(): Boolean;
var
  I: Integer;
begin
  Result := False;
  for I := 1 to ParamCount do
    if CompareText(ParamStr(I), '/REMOVEDATA') = 0 then
      Result := True;
end;

procedure CurUninstallStepChanged(CurUninstallStep: TUninstallStep);
var
  DataDir: String;
begin
  if CurUninstallStep = usUninstall then
  begin
    StopHeadroom();
    RemoveRunValue();
    RemoveFromPath(ExpandConstant('{app}'));
  end;
  if CurUninstallStep = usPostUninstall then
  begin
    DataDir := ExpandConstant('{localappdata}\headroom');
    if not DirExists(DataDir) then
      exit;
    if RemoveDataAsked() or
       ((not UninstallSilent()) and
        (MsgBox('Also delete your Headroom settings, memory history and job logs?' + #13#10 +
                '(' + DataDir + ')' + #13#10#13#10 +
                'Choose No to keep them for a later install.',
                mbConfirmation, MB_YESNO or MB_DEFBUTTON2) = IDYES)) then
      DelTree(DataDir, True, True, True);
  end;
end;
